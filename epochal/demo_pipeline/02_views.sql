-- Every view is maintained incrementally from its inputs' changes; the plan of each (its key, the
-- state it reads, the stages it was split into) is in its asset's description in the Dagster UI.

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

-- Per auction: its category, number of bids, highest and average price. Keyed by the auction id:
-- an epoch's bids and auctions touch only their own auctions' state.
CREATE MATERIALIZED VIEW auction_stats AS
SELECT a.id AS auction, a.category, count(*) AS bids, max(b.price) AS top_price, avg(b.price) AS avg_price
FROM auction a
JOIN bid b ON a.id = b.auction
GROUP BY a.id, a.category;

-- The three highest bids of every auction (top-N per group; ties broken by time, then bidder).
CREATE MATERIALIZED VIEW top_bids AS
SELECT auction, bidder, price, date_time
FROM (
    SELECT auction, bidder, price, date_time,
           ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC, date_time, bidder) AS rn
    FROM bid
)
WHERE rn <= 3;

-- Bids per category: the join is keyed by auction and the grouping by category, so the planner
-- keeps the join as an internal stage (category_volume__stage1), its rows counted and summed per category
-- as partial state in a second (category_volume__stage2), which this view projects.
CREATE MATERIALIZED VIEW category_volume AS
SELECT a.category, count(*) AS bids, sum(b.price) AS volume
FROM bid b
JOIN auction a ON a.id = b.auction
GROUP BY a.category;

-- Bids per 10-second tumbling window of event time. Its state is a stage (bids_per_window__stage1)
-- that keeps each window's 16 highest prices beside the count: were the top bid retracted, the
-- next would come from them, not from rereading bid. This view projects the stage.
CREATE MATERIALIZED VIEW bids_per_window AS
SELECT w.start AS window_start, w.end AS window_end, count(*) AS bids, max(price) AS top_price
FROM (SELECT price, window(date_time, '10 seconds') AS w FROM bid)
GROUP BY w.start, w.end;
