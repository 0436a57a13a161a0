-- Every big bid, appended to a DuckDB table once its epoch is checkpointed.
CREATE SINK big_bids_out FROM big_bids
WITH (
    connector = 'duckdb',
    database = 'out/sink.duckdb',
    table = 'big_bids',
    type = 'append-only'
);

-- Auction statistics, kept current in DuckDB: an upsert sink applies each epoch's retractions and
-- insertions by key. The key must be unique in the view, and the view groups by (auction, category).
CREATE SINK auction_stats_out FROM auction_stats
WITH (
    connector = 'duckdb',
    database = 'out/sink.duckdb',
    table = 'auction_stats',
    type = 'upsert',
    primary_key = 'auction, category'
);
