-- Seed rows that exist before any connector is deployed. They must survive
-- the deletion of every connector (the walkthrough and the integration suite
-- check it).
INSERT INTO shop.customers (name, email) VALUES
    ('Ada Lovelace',   'ada@example.com'),
    ('Alan Turing',    'alan@example.com'),
    ('Grace Hopper',   'grace@example.com')
ON CONFLICT (email) DO NOTHING;

INSERT INTO shop.orders (customer_id, amount, status)
SELECT c.id, v.amount, v.status
FROM (VALUES
    ('ada@example.com',   12.50, 'paid'),
    ('alan@example.com',  99.00, 'new'),
    ('grace@example.com',  7.25, 'shipped')
) AS v (email, amount, status)
JOIN shop.customers c ON c.email = v.email
WHERE NOT EXISTS (SELECT 1 FROM shop.orders);
