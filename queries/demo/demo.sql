-- :name drop_demo_schema :affected
-- :doc pybatch demo - drop the demo's own schema and everything in it, so every demo run starts
-- from an empty target (the pybatch schema is left alone).
DROP SCHEMA IF EXISTS pybatch_demo CASCADE;

-- :name create_demo_schema :affected
-- :doc pybatch demo - create the schema that holds the demo's target table.
CREATE SCHEMA pybatch_demo;

-- :name create_demo_orders :affected
-- :doc pybatch demo - the target table the demo job loads, one row per line of the source CSV.
CREATE TABLE pybatch_demo.orders (
    id BIGINT NOT NULL,
    customer TEXT NOT NULL,
    amount NUMERIC(12, 2) NOT NULL,
    order_day DATE NOT NULL,
    CONSTRAINT orders_pkey PRIMARY KEY (id)
);

-- :name copy_demo_orders :affected
-- :doc pybatch demo - the business write of one chunk, run through the chunk's COPY with the rows
-- of the source CSV in column order.
COPY pybatch_demo.orders (id, customer, amount, order_day) FROM STDIN;

-- :name demo_orders_digest :one
-- :doc pybatch demo - count and fingerprint the target, sha256 over one line per row in id order,
-- formatted like the source CSV (id, customer, amount, order_day joined by commas, then a newline).
SELECT
    pg_catalog.COUNT(*) AS row_count,
    pg_catalog.ENCODE(
        pg_catalog.SHA256(
            pg_catalog.CONVERT_TO(
                COALESCE(
                    pg_catalog.STRING_AGG(
                        pg_catalog.CONCAT_WS(
                            ',',
                            CAST(o.id AS TEXT),
                            o.customer,
                            CAST(o.amount AS TEXT),
                            pg_catalog.TO_CHAR(o.order_day, 'YYYY-MM-DD')
                        )
                        || pg_catalog.CHR(10),
                        ''
                        ORDER BY o.id
                    ),
                    ''
                ),
                'UTF8'
            )
        ),
        'hex'
    ) AS sha256
FROM pybatch_demo.orders AS o;
