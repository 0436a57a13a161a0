-- The three Nexmark streams (https://github.com/nexmark/nexmark) for the benchmark queries in
-- 02_queries.sql. Every source reads the same event stream (event numbers interleave Person,
-- Auction and Bid 1:3:46) and keeps its own type, so all three must agree on the split count, the
-- events per epoch, the event gap and the base time: then epoch N holds the same event numbers in
-- every source, and a bid never refers to an auction or person a later epoch creates.
--
-- 3000 events an epoch (60 people, 180 auctions, 2760 bids) keep each epoch small; a few epochs
-- give the joins plenty to match. One event every 10 ms (the default is 0.1 ms) spreads an epoch
-- over 30 s of event time, so the 10-second tumbling and 2-second hopping windows of q5, q7 and q8
-- see many windows instead of all events falling into the first one.

CREATE SOURCE person (
    id            BIGINT,
    name          STRING,
    email_address STRING,
    credit_card   STRING,
    city          STRING,
    state         STRING,
    date_time     TIMESTAMP,
    extra         STRING
) WITH (
    connector = 'nexmark',
    'nexmark.table.type' = 'Person',
    'nexmark.split.num' = '2',
    'max.events.per.epoch' = '3000',
    'nexmark.min.event.gap.in.ns' = '10000000'
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
    'nexmark.split.num' = '2',
    'max.events.per.epoch' = '3000',
    'nexmark.min.event.gap.in.ns' = '10000000'
);

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
    'nexmark.split.num' = '2',
    'max.events.per.epoch' = '3000',
    'nexmark.min.event.gap.in.ns' = '10000000'
);
