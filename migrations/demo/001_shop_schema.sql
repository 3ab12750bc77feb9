-- Demo schema for the tidyconnect walkthrough (docker-compose.yml mounts this
-- directory into /docker-entrypoint-initdb.d, so it runs once, on an empty
-- data volume). These are "your" tables: pgaudit captures changes to them but
-- never owns, alters or drops them.
CREATE SCHEMA IF NOT EXISTS shop;

CREATE TABLE IF NOT EXISTS shop.customers (
    id         bigserial   PRIMARY KEY,
    name       text        NOT NULL,
    email      text        NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS shop.orders (
    id          bigserial     PRIMARY KEY,
    customer_id bigint        NOT NULL REFERENCES shop.customers (id),
    amount      numeric(10,2) NOT NULL CHECK (amount >= 0),
    status      text          NOT NULL DEFAULT 'new',
    created_at  timestamptz   NOT NULL DEFAULT now()
);
