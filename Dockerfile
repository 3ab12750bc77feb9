# syntax=docker/dockerfile:1
#
# The tidyconnect worker image: a static binary built exactly as `make build`
# builds it (integration/compose_test.go checks that the two commands agree),
# run as a non-root user with its state in /var/lib/tidyconnect.

FROM golang:1.26-alpine AS build
WORKDIR /src
# Dependencies first, so a source change does not re-download modules.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# .git is not in the build context (.dockerignore): pass the version in.
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/tidyconnect/tidyconnect/runtime/version.Version=${VERSION} -X github.com/tidyconnect/tidyconnect/runtime/version.Commit=${COMMIT}" -o /out/tidyconnect ./cmd/tidyconnect

# Alpine rather than scratch: the healthcheck needs wget, and operators want a
# shell for `docker compose exec`. The binary itself needs nothing from it.
FROM alpine:3.22
RUN apk add --no-cache ca-certificates tzdata \
 && addgroup -S -g 10001 tidyconnect \
 && adduser -S -D -H -u 10001 -G tidyconnect -s /sbin/nologin tidyconnect \
 && mkdir -p /var/lib/tidyconnect \
 && chown tidyconnect:tidyconnect /var/lib/tidyconnect
COPY --from=build /out/tidyconnect /usr/local/bin/tidyconnect
USER 10001:10001
ENV TIDYCONNECT_DATA_DIR=/var/lib/tidyconnect \
    TIDYCONNECT_REST_ADDR=:8083
VOLUME ["/var/lib/tidyconnect"]
EXPOSE 8083
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=12 \
  CMD ["wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8083/health"]
ENTRYPOINT ["/usr/local/bin/tidyconnect"]
CMD ["standalone"]
