-- Views are stateless for now: filters, projections, expressions and UNION ALL.

-- Bids over 1000, with the price converted from dollars to euros (Nexmark q1 + a filter).
CREATE MATERIALIZED VIEW big_bids AS
SELECT auction, bidder, price * 0.908 AS price_eur, date_time
FROM bid
WHERE price > 1000;

-- A view over a view: each big bid tagged with a price band.
CREATE MATERIALIZED VIEW big_bids_banded AS
SELECT
    auction,
    bidder,
    price_eur,
    CASE
        WHEN price_eur >= 10000 THEN 'very high'
        WHEN price_eur >= 5000 THEN 'high'
        ELSE 'medium'
    END AS band,
    date_time
FROM big_bids;
