package connect

import (
	"errors"
	"strings"
	"testing"
)

func TestConfigDefValidate(t *testing.T) {
	def := ConfigDef{
		{Name: "url", Type: TypeString, Required: true, Secret: true},
		{Name: "n", Type: TypeInt, Default: "3"},
		{Name: "flag", Type: TypeBoolean, Default: "false"},
		{Name: "mode", Type: TypeString, Default: "a", Validate: func(v string) error {
			if v != "a" && v != "b" {
				return errors.New("must be a or b")
			}
			return nil
		}},
	}
	tests := []struct {
		name    string
		cfg     Config
		badKeys []string
	}{
		{"valid", Config{"url": "x", "n": "5", "flag": "TRUE", "mode": "b"}, nil},
		{"defaults", Config{"url": "x"}, nil},
		{"missing required", Config{}, []string{"url"}},
		{"blank required", Config{"url": "  "}, []string{"url"}},
		{"every bad field", Config{"n": "five", "flag": "yes", "mode": "c"}, []string{"url", "n", "flag", "mode"}},
		{"int overflow", Config{"url": "x", "n": "99999999999"}, []string{"n"}},
		// Present but blank: Kafka Connect refuses it for numbers and
		// booleans; a blank string is a value like any other.
		{"blank number and boolean", Config{"url": "x", "n": "", "flag": " ", "mode": "a"}, []string{"n", "flag"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := def.Validate(tt.cfg)
			if len(errs) != len(tt.badKeys) {
				t.Fatalf("errors %v, want keys %v", errs, tt.badKeys)
			}
			for _, k := range tt.badKeys {
				if len(errs[k]) == 0 {
					t.Errorf("no error for %s: %v", k, errs)
				}
				for _, msg := range errs[k] {
					if !strings.Contains(msg, k) {
						t.Errorf("message %q does not name %s", msg, k)
					}
				}
			}
		})
	}
}

func TestMaskCredentials(t *testing.T) {
	tests := []struct{ in, want string }{
		{"amqp://guest:guest@localhost:5672/", "amqp://guest:xxxxx@localhost:5672/"},
		{"postgres://u:p%40ss@h:5432/db?sslmode=disable", "postgres://u:xxxxx@h:5432/db?sslmode=disable"},
		{"postgres://u@h/db?password=s3cret", "postgres://u@h/db?password=xxxxx"},
		{"host=h user=u password=s3cret dbname=d", "host=h user=u password=xxxxx dbname=d"},
		{"host=h password='a b' dbname=d", "host=h password=xxxxx dbname=d"},
		{"postgres://u@h/db", "postgres://u@h/db"},
		{"plain", "plain"},
		// Passwords net/url cannot read, or reads otherwise, than libpq.
		{"postgres://postgres:S3cr#PW@127.0.0.1:5432/test", "postgres://postgres:xxxxx@127.0.0.1:5432/test"},
		{"postgres://u:a?b@h/db?sslmode=disable", "postgres://u:xxxxx@h/db?sslmode=disable"},
		{"postgres://u:S3cr%zzPW@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:p@ss@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:pw@[::1:5432/db", "postgres://u:xxxxx@[::1:5432/db"},
		{"postgres://u:pw@h1:5432,h2:5433/db", "postgres://u:xxxxx@h1:5432,h2:5433/db"},
		{"postgres://u:@h/db", "postgres://u:xxxxx@h/db"},
		// A '/' in a password: libpq cannot use the URL, but errors quote it.
		{"postgres://u:S3cr/PW@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://h:5432/db?sslmode=disable", "postgres://h:5432/db?sslmode=disable"},
		{"postgres://h/db?user=u&password=ab#cd", "postgres://h/db?user=u&password=xxxxx"},
		{"postgres://db:5432/app?user=alice@corp&password=pw", "postgres://db:5432/app?user=alice@corp&password=xxxxx"},
		// sslpassword: the passphrase of the client's key.
		{"postgres://u@h/db?sslmode=verify-full&sslpassword=k3y&password=s3cret", "postgres://u@h/db?sslmode=verify-full&sslpassword=xxxxx&password=xxxxx"},
		{"host=h sslpassword=k3y password=s3cret", "host=h sslpassword=xxxxx password=xxxxx"},
		{"host=h sslpassword = 'k 3y'", "host=h sslpassword = xxxxx"},
		// libpq and pgx read a backslash in an unquoted value as escaping
		// the next character, a space included: the password is "top secret".
		{`host=h password=top\ secret dbname=d`, "host=h password=xxxxx dbname=d"},
		{`host=h password=a\'b\ c`, "host=h password=xxxxx"},
		// "://" inside a DSN's password does not make the DSN a URL.
		{"host=h user=u password=Xy7://Qz9 dbname=d", "host=h user=u password=xxxxx dbname=d"},
		{"host=h password='a://b c' dbname=d", "host=h password=xxxxx dbname=d"},
		{`host=h password=a\ b://c dbname=d`, "host=h password=xxxxx dbname=d"},
		// A URL after other words (an error message) is still a URL.
		{"connecting to postgres://u:pw@h/db failed", "connecting to postgres://u:xxxxx@h/db failed"},
	}
	for _, tt := range tests {
		if got := MaskCredentials(tt.in); got != tt.want {
			t.Errorf("MaskCredentials(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestMaskAndUnmask(t *testing.T) {
	def := ConfigDef{
		{Name: "url", Type: TypeString, Secret: true},
		{Name: "pw", Type: TypePassword},
	}
	stored := Config{"url": "amqp://u:secret@h/", "pw": "p", "other.password": "q", "plain": "v"}
	masked := def.Mask(stored)
	for k, v := range masked {
		if strings.Contains(v, "secret") || v == "p" || v == "q" {
			t.Errorf("%s not masked: %q", k, v)
		}
	}
	if masked["plain"] != "v" {
		t.Errorf("plain value changed: %q", masked["plain"])
	}
	update := masked.Clone()
	update["plain"] = "w"
	got := def.Unmask(update, stored)
	if got["url"] != stored["url"] || got["pw"] != "p" || got["plain"] != "w" {
		t.Errorf("Unmask = %v", got)
	}
	// A genuinely new secret is kept.
	update["url"] = "amqp://u:new@h/"
	if got := def.Unmask(update, stored); got["url"] != "amqp://u:new@h/" {
		t.Errorf("new secret replaced: %v", got["url"])
	}
}

func TestMemoryLedger(t *testing.T) {
	ctx := t.Context()
	l := NewMemoryLedger()
	a := Resource{Kind: "k", Name: "a", Location: "l"}
	b := Resource{Kind: "k", Name: "b", Location: "l"}
	for _, r := range []Resource{a, b, a} {
		if err := l.Own(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := l.List(ctx)
	if len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("List = %v", got)
	}
	_ = l.Release(ctx, a)
	_ = l.Release(ctx, a)
	got, _ = l.List(ctx)
	if len(got) != 1 || got[0] != b {
		t.Fatalf("after release List = %v", got)
	}
}
