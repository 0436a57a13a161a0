-- Every big bid, appended to a DuckDB table once its epoch is checkpointed.
CREATE SINK big_bids_out FROM big_bids
WITH (
    connector = 'duckdb',
    database = 'out/sink.duckdb',
    table = 'big_bids',
    type = 'append-only'
);
