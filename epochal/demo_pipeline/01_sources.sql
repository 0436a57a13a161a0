-- Nexmark auction benchmark streams (https://github.com/nexmark/nexmark), generated in-process.
-- Each epoch reads at most max.events.per.epoch events, spread over the splits.

CREATE SOURCE bid (
    auction   BIGINT,
    bidder    BIGINT,
    price     BIGINT,
    channel   STRING,
    url       STRING,
    date_time TIMESTAMP,
    extra     STRING
) WITH (
    connector = 'nexmark',
    'nexmark.table.type' = 'Bid',
    'nexmark.split.num' = '4',
    'max.events.per.epoch' = '10000'
);

CREATE SOURCE auction (
    id          BIGINT,
    item_name   STRING,
    description STRING,
    initial_bid BIGINT,
    reserve     BIGINT,
    date_time   TIMESTAMP,
    expires     TIMESTAMP,
    seller      BIGINT,
    category    BIGINT,
    extra       STRING
) WITH (
    connector = 'nexmark',
    'nexmark.table.type' = 'Auction',
    'nexmark.split.num' = '1',
    'max.events.per.epoch' = '2000'
);
