"""The Nexmark benchmark generator (Apache Beam / RisingWave semantics) as a source connector.

Event numbers 0, 1, 2, ... interleave Person, Auction and Bid events 1:3:46 over every block of 50.
Unlike the Beam generator, which draws from a ``Random`` seeded per event, every field here is a
Spark expression of the event number alone (``xxhash64(e, salt)`` stands in for the random draws).
So any offset range can be read again, on any cluster, with identical results, and nothing is
generated on the driver.

Deliberate departures from Beam, all so that a reference never points into the future (a join of
bids to auctions, or auctions to sellers, would otherwise miss rows depending on where an epoch
boundary falls):

* no "leads" (Beam adds 10 ids past the newest person/auction to mimic parallel generators; here
  all splits share one id space, so there is nothing to mimic);
* a hot bidder (the second person of the current batch of 100) falls back to the newest person
  while that second person does not exist yet;
* the url of a non-hot channel is a function of the channel number (Beam caches it per channel,
  so within one JVM it is too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING

from epochal.connectors.base import SourceBatch, SplitRange
from epochal.errors import EpochalError, require
from epochal.options import unknown_option_problems, whole_number_option

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from epochal.pipeline.model import Column, SourceDef

NEXMARK_OPTIONS = (
    "connector",
    "nexmark.table.type",
    "nexmark.split.num",
    "nexmark.event.num",
    "max.events.per.epoch",
    "nexmark.min.event.gap.in.ns",
    "nexmark.base.time",
)

#: 2015-07-15T00:00:00Z, Beam's Nexmark BASE_TIME: fixed so that runs are reproducible.
DEFAULT_BASE_TIME_MS = 1_436_918_400_000
DEFAULT_MIN_EVENT_GAP_NS = 100_000
DEFAULT_MAX_EVENTS_PER_EPOCH = 10_000
# Bounds that keep the generator's BIGINT arithmetic and timestamps in range.
MAX_BASE_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, Spark's last timestamp
MAX_EVENT_GAP_NS = 3_600_000_000_000  # an hour between events

# Generator constants (Beam GeneratorConfig / NexmarkConfiguration defaults).
PERSON_PROPORTION = 1
AUCTION_PROPORTION = 3
BID_PROPORTION = 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
NUM_ACTIVE_PEOPLE = 1000
NUM_IN_FLIGHT_AUCTIONS = 100
HOT_AUCTION_RATIO = 2  # 1 - 1/2 of bids go to a hot auction
HOT_SELLERS_RATIO = 4  # 1 - 1/4 of auctions are by a hot seller
HOT_BIDDERS_RATIO = 4  # 1 - 1/4 of bids are by a hot bidder
HOT_BATCH = 100  # the hot auction/seller/bidder is the first (second) of the current batch of 100
HOT_CHANNELS_RATIO = 2
CHANNELS_NUMBER = 10_000
AVG_PERSON_BYTES = 200
AVG_AUCTION_BYTES = 500
AVG_BID_BYTES = 100

FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = (
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
)
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
# Beam draws these four once per JVM; fixed here so that every run agrees.
HOT_URLS = (
    "https://www.nexmark.com/hsep/zoi/rtkq/item.htm?query=1",
    "https://www.nexmark.com/bqw_/nye/ezu/item.htm?query=1",
    "https://www.nexmark.com/kbsd/ug_/mfjw/item.htm?query=1",
    "https://www.nexmark.com/tlc/yhfa/_pr/item.htm?query=1",
)

TABLE_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "Person": (
        ("id", "BIGINT"),
        ("name", "STRING"),
        ("email_address", "STRING"),
        ("credit_card", "STRING"),
        ("city", "STRING"),
        ("state", "STRING"),
        ("date_time", "TIMESTAMP"),
        ("extra", "STRING"),
    ),
    "Auction": (
        ("id", "BIGINT"),
        ("item_name", "STRING"),
        ("description", "STRING"),
        ("initial_bid", "BIGINT"),
        ("reserve", "BIGINT"),
        ("date_time", "TIMESTAMP"),
        ("expires", "TIMESTAMP"),
        ("seller", "BIGINT"),
        ("category", "BIGINT"),
        ("extra", "STRING"),
    ),
    "Bid": (
        ("auction", "BIGINT"),
        ("bidder", "BIGINT"),
        ("price", "BIGINT"),
        ("channel", "STRING"),
        ("url", "STRING"),
        ("date_time", "TIMESTAMP"),
        ("extra", "STRING"),
    ),
}


@dataclass(frozen=True)
class NexmarkConfig:
    #: "Person", "Auction" or "Bid"
    table: str
    split_num: int = 1
    #: total events (all types, all splits) before the source stops; None: unbounded
    event_num: int | None = None
    max_events_per_epoch: int = DEFAULT_MAX_EVENTS_PER_EPOCH
    min_event_gap_ns: int = DEFAULT_MIN_EVENT_GAP_NS
    base_time_ms: int = DEFAULT_BASE_TIME_MS

    def split_event_count(self, split: int) -> int | None:
        """How many events split ``split`` owns in total (event numbers split, split+n, ... < event_num)."""
        if self.event_num is None:
            return None
        n = self.split_num
        return max(0, (self.event_num - split + n - 1) // n)


def parse_nexmark_options(options: Mapping[str, str]) -> tuple[NexmarkConfig | None, list[str]]:
    """The config for ``options`` and the problems with them (config is None when there are any)."""
    problems = unknown_option_problems("nexmark", options, NEXMARK_OPTIONS)
    choices = ", ".join(TABLE_COLUMNS)
    raw_table = options.get("nexmark.table.type")
    table = None
    if raw_table is None or not raw_table.strip():
        problems.append(f"nexmark source needs option nexmark.table.type = '...', one of: {choices}")
    else:
        table = next((t for t in TABLE_COLUMNS if t.lower() == raw_table.strip().lower()), None)
        if table is None:
            problems.append(f"nexmark.table.type '{raw_table}' is not a Nexmark table: use one of {choices}")
    split_num = whole_number_option(options, "nexmark.split.num", 1, 1, problems)
    event_num = whole_number_option(options, "nexmark.event.num", None, 0, problems)
    # 0 is allowed: an idle source (and the empty-epoch benchmark) still moves epochs forward
    max_events = whole_number_option(options, "max.events.per.epoch", DEFAULT_MAX_EVENTS_PER_EPOCH, 0, problems)
    gap = whole_number_option(
        options, "nexmark.min.event.gap.in.ns", DEFAULT_MIN_EVENT_GAP_NS, 0, problems, MAX_EVENT_GAP_NS
    )
    base_time = whole_number_option(options, "nexmark.base.time", DEFAULT_BASE_TIME_MS, 0, problems, MAX_BASE_TIME_MS)
    if problems or table is None:
        return None, problems
    require(
        None not in (split_num, max_events, gap, base_time), "nexmark options without problems are all set"
    )
    return NexmarkConfig(table, split_num, event_num, max_events, gap, base_time), []


def _normalize_type(ddl: str) -> str:
    return " ".join(ddl.upper().split())


class NexmarkConnectorSpec:
    name = "nexmark"
    # (each event is a function of its number, the split count and these: another value is another stream)
    identity_options = ("nexmark.table.type", "nexmark.split.num", "nexmark.min.event.gap.in.ns", "nexmark.base.time")
    fields_by_spelling = False  # (events are generated by column name)
    _defaults: Mapping[str, int] = {
        "nexmark.split.num": 1,
        "nexmark.min.event.gap.in.ns": DEFAULT_MIN_EVENT_GAP_NS,
        "nexmark.base.time": DEFAULT_BASE_TIME_MS,
    }

    def identity_value(self, option: str, value: str | None, home: Path | None = None) -> str | None:
        if option == "nexmark.table.type":
            return value.strip().lower() if value is not None else None
        if option not in self._defaults:
            return value
        if value is None:
            return str(self._defaults[option])
        try:
            return str(int(value.strip()))
        except ValueError:
            return value

    def validate(self, columns: "tuple[Column, ...]", options: Mapping[str, str]) -> list[str]:
        config, problems = parse_nexmark_options(options)
        if config is None:
            return problems  # without a valid table there is nothing to check the columns against
        available = dict(TABLE_COLUMNS[config.table])
        names = ", ".join(available)
        for column in columns:
            expected = available.get(column.name.lower())
            if expected is None:
                problems.append(
                    f"column '{column.name}' is not a column of the nexmark {config.table} table (available: {names})"
                )
            elif _normalize_type(column.type) != expected:
                problems.append(
                    f"column '{column.name}' of the nexmark {config.table} table is {expected}, "
                    f"not {column.type}: declare it as {column.name} {expected}"
                )
        return problems

    def create(self, source: "SourceDef", home: Path) -> "NexmarkSource":
        problems = self.validate(source.columns, source.options)
        if problems:
            raise EpochalError(f"source {source.name}: " + "; ".join(problems))
        config, _ = parse_nexmark_options(source.options)
        require(config is not None, "the loader accepted these nexmark options")
        return NexmarkSource(config, source.columns)


class NexmarkSource:
    """Split i of n owns event numbers i, i+n, i+2n, ...; offset k of split i is event i + k*n.

    Offsets count events of every type, so a Bid source's offsets also step over the Person and
    Auction events of its split (and max.events.per.epoch counts those too)."""

    def __init__(self, config: NexmarkConfig, columns: "tuple[Column, ...]"):
        self.config = config
        self.columns = columns

    def plan(self, start: Mapping[str, int]) -> list[SplitRange]:
        n = self.config.split_num
        self._check_splits(start)
        budget = self.config.max_events_per_epoch
        ranges = []
        for i in range(n):
            first = start.get(str(i), 0)
            share = budget // n + (1 if i < budget % n else 0)
            end = first + share
            limit = self.config.split_event_count(i)
            if limit is not None:
                end = max(first, min(end, limit))
            ranges.append(SplitRange(str(i), first, end))
        return ranges

    def read(self, spark: "SparkSession", ranges: list[SplitRange]) -> SourceBatch:
        from pyspark.sql import functions as F

        n = self.config.split_num
        self._check_splits([r.split for r in ranges])
        frames = []
        for r in ranges:
            if r.count > 0:
                frames.append(spark.range(r.start, r.end).select(F.expr(f"{int(r.split)} + id * {n}").alias("e")))
        # an empty range still goes through the generator, so an empty epoch has the right schema
        events = reduce(lambda a, b: a.unionAll(b), frames) if frames else spark.range(0).select(F.col("id").alias("e"))
        generated = _generate(events, self.config)
        # validate() matched the declared names case-insensitively; the generator's are lower case
        rows = generated.select(*[F.col(c.name.lower()).alias(c.name) for c in self.columns])
        return SourceBatch(rows=rows)

    def _check_splits(self, splits: Iterable[str]) -> None:
        # offsets mean different event numbers under another split count, so reading on would
        # silently duplicate and skip events
        n = self.config.split_num
        unknown = sorted(set(splits) - {str(i) for i in range(n)})
        if unknown:
            raise EpochalError(
                f"nexmark split(s) {', '.join(unknown)} do not exist with nexmark.split.num = {n}: the "
                f"stored offsets come from a different split count; restore it or reset the source's offsets"
            )


# --- generator expressions (Spark SQL over the column `e`, the event number) -------------------------


def _hash(salt: str, key: str = "e", *more: str) -> str:
    # xxhash64 of (key, salt[, more]): a fixed, platform-independent function, unlike rand()
    return f"xxhash64({', '.join([key, repr(salt), *more])})"


def _below(salt: str, bound: str | int, key: str = "e") -> str:
    """A draw in [0, bound), like Beam's ``nextLong(random, bound)``."""
    return f"pmod({_hash(salt, key)}, {bound})"


def _unit(salt: str) -> str:
    """A draw in [0, 1), like ``random.nextDouble()``: 53 bits, as many as a double holds."""
    return f"(pmod({_hash(salt)}, {1 << 53}) / {float(1 << 53)}D)"


def _pick(salt: str, values: tuple[str, ...]) -> str:
    array = ", ".join(repr(v) for v in values)
    return f"element_at(array({array}), CAST(1 + {_below(salt, len(values))} AS INT))"


def _string(salt: str, max_length: int, special: str = " ", key: str = "e") -> str:
    """Beam's ``nextString``: 3 to max_length-1 lower-case letters, 1 in 13 ``special``, trimmed."""
    length = f"(3 + {_below(salt + '.len', max_length - 3, key)})"
    h = _hash(salt, key, "x_")
    char = f"IF(pmod({h}, 13) = 0, {special!r}, char(97 + pmod({h} div 13, 26)))"
    return f"trim(array_join(transform(sequence(1, {length}), x_ -> {char}), ''))"


def _exact_string(salt: str, length: str) -> str:
    """Beam's ``nextExactString``: exactly ``length`` lower-case letters (length may be 0)."""
    char = f"char(97 + pmod({_hash(salt, 'e', 'x_')}, 26))"
    return f"IF({length} > 0, array_join(transform(sequence(1, {length}), x_ -> {char}), ''), '')"


def _extra_size(salt: str, current_size: str, average: int) -> str:
    """Beam's ``nextExtra`` length: pads an event to ``average`` bytes, +-20%."""
    desired = f"({average} - ({current_size}))"
    delta = f"CAST(round({desired} * 0.2) AS BIGINT)"
    # (greatest: the pmod may be evaluated outside its IF, as in _next_auction; delta = 0 gives 0 either way)
    spread = f"IF({delta} = 0, 0, {_below(salt, f'greatest(2 * {delta}, 1)')})"
    return f"IF(({current_size}) > {average}, 0, {desired} - {delta} + {spread})"


def _price(salt: str) -> str:
    """Beam's ``nextPrice``: log-uniform in [100, 100_000_000]."""
    return f"CAST(round(power(10D, {_unit(salt)} * 6.0) * 100.0) AS BIGINT)"


def _next_person(salt: str) -> str:
    """A random base-0 id among the NUM_ACTIVE_PEOPLE newest people (Beam's nextBase0PersonId)."""
    active = f"least(_last_person + 1, {NUM_ACTIVE_PEOPLE})"
    return f"(_last_person + 1 - {active} + {_below(salt, active)})"


def _next_auction(salt: str) -> str:
    """A random base-0 id among the auctions likely still in flight (Beam's nextBase0AuctionId)."""
    low = f"greatest(_last_auction - {NUM_IN_FLIGHT_AUCTIONS}, 0)"
    # The bound is at least 1 wherever the id is used (a bid's _last_auction >= 0), but Spark may
    # evaluate it for rows its guards exclude: without whole-stage codegen a predicate pushed into
    # the generator's filter hoists it out of the CASE, and the first events' _last_auction of -1
    # made it a REMAINDER_BY_ZERO. greatest(.., 1) changes no value the guards let through.
    return f"({low} + {_below(salt, f'greatest(_last_auction - {low} + 1, 1)')})"


def _channel_id(number: str) -> str:
    """``Math.abs(Integer.reverse(number))``: the 32 bits of ``number`` reversed, as a magnitude."""
    reversed_bits = f"CAST(conv(reverse(lpad(conv({number}, 10, 2), 32, '0')), 2, 10) AS BIGINT)"
    return f"IF({reversed_bits} >= {1 << 31}, {1 << 32} - {reversed_bits}, {reversed_bits})"


def _base_url(key: str) -> str:
    parts = ", '/', ".join(_string(f"bid.url.{i}", 5, "_", key) for i in range(3))
    return f"concat('https://www.nexmark.com/', {parts}, '/item.htm?query=1')"


def _generate(events: "DataFrame", config: NexmarkConfig) -> "DataFrame":
    """All columns of ``config.table`` for the events of that type among ``events`` (column ``e``)."""
    from pyspark.sql import functions as F

    def stage(df: "DataFrame", **columns: str) -> "DataFrame":
        return df.withColumns({name: F.expr(sql) for name, sql in columns.items()})

    d, pp, ap = PROPORTION_DENOMINATOR, PERSON_PROPORTION, AUCTION_PROPORTION
    position = f"pmod(e, {d})"
    kind = {"Person": f"{position} < {pp}", "Auction": f"{position} >= {pp} AND {position} < {pp + ap}"}
    kind["Bid"] = f"{position} >= {pp + ap}"
    df = events.where(F.expr(kind[config.table]))

    # Beam's lastBase0PersonId / lastBase0AuctionId: the newest person/auction at or before event e.
    date_time_us = f"{config.base_time_ms * 1000} + (e * {config.min_event_gap_ns}) div 1000"
    df = stage(
        df,
        _last_person=f"(e div {d}) * {pp} + least({position}, {pp - 1})",
        _last_auction=(
            f"CASE WHEN {position} < {pp} THEN (e div {d} - 1) * {ap} + {ap - 1} "
            f"WHEN {position} >= {pp + ap} THEN (e div {d}) * {ap} + {ap - 1} "
            f"ELSE (e div {d}) * {ap} + {position} - {pp} END"
        ),
        _date_time_us=date_time_us,
        date_time="timestamp_micros(" + date_time_us + ")",
    )

    if config.table == "Person":
        df = stage(
            df,
            id=f"_last_person + {FIRST_PERSON_ID}",
            name=f"concat({_pick('person.first', FIRST_NAMES)}, ' ', {_pick('person.last', LAST_NAMES)})",
            email_address=f"concat({_string('person.email.user', 7)}, '@', {_string('person.email.host', 5)}, '.com')",
            credit_card="concat_ws(' ', "
            + ", ".join(f"lpad(CAST({_below(f'person.card.{i}', 10_000)} AS STRING), 4, '0')" for i in range(4))
            + ")",
            city=_pick("person.city", US_CITIES),
            state=_pick("person.state", US_STATES),
        )
        size = "8 + length(name) + length(email_address) + length(credit_card) + length(city) + length(state)"
        df = stage(df, _extra_size=_extra_size("person.extra.size", size, AVG_PERSON_BYTES))
        df = stage(df, extra=_exact_string("person.extra", "_extra_size"))

    elif config.table == "Auction":
        # Beam's nextAuctionLengthMs: expiry averages the time it takes to create the next
        # NUM_IN_FLIGHT_AUCTIONS auctions.
        events_for_auctions = NUM_IN_FLIGHT_AUCTIONS * d // ap
        horizon_ms = events_for_auctions * config.min_event_gap_ns // 1_000_000
        hot_seller = f"(_last_person div {HOT_BATCH}) * {HOT_BATCH}"
        df = stage(
            df,
            id=f"_last_auction + {FIRST_AUCTION_ID}",
            item_name=_string("auction.name", 20),
            description=_string("auction.desc", 100),
            initial_bid=_price("auction.initial"),
            seller=f"IF({_below('auction.hot_seller', HOT_SELLERS_RATIO)} > 0, {hot_seller}, "
            f"{_next_person('auction.seller')}) + {FIRST_PERSON_ID}",
            category=f"{FIRST_CATEGORY_ID} + {_below('auction.category', NUM_CATEGORIES)}",
            expires=f"timestamp_micros(_date_time_us + 1000 * "
            f"(1 + {_below('auction.length', max(2 * horizon_ms, 1))}))",
        )
        df = stage(
            df,
            reserve=f"initial_bid + {_price('auction.reserve')}",
            _extra_size=_extra_size(
                "auction.extra.size", "8 + length(item_name) + length(description) + 40", AVG_AUCTION_BYTES
            ),
        )
        df = stage(df, extra=_exact_string("auction.extra", "_extra_size"))

    else:
        hot_auction = f"(_last_auction div {HOT_BATCH}) * {HOT_BATCH}"
        hot_bidder = f"least((_last_person div {HOT_BATCH}) * {HOT_BATCH} + 1, _last_person)"
        channel_number = _below("bid.channel", CHANNELS_NUMBER)
        hot_index = f"CAST(1 + {_below('bid.hot_channel.index', len(HOT_CHANNELS))} AS INT)"
        hot_channels = ", ".join(repr(c) for c in HOT_CHANNELS)
        hot_urls = ", ".join(repr(u) for u in HOT_URLS)
        df = stage(
            df,
            auction=f"IF({_below('bid.hot_auction', HOT_AUCTION_RATIO)} > 0, {hot_auction}, "
            f"{_next_auction('bid.auction')}) + {FIRST_AUCTION_ID}",
            bidder=f"IF({_below('bid.hot_bidder', HOT_BIDDERS_RATIO)} > 0, {hot_bidder}, "
            f"{_next_person('bid.bidder')}) + {FIRST_PERSON_ID}",
            price=_price("bid.price"),
            _hot_channel=f"{_below('bid.hot_channel', HOT_CHANNELS_RATIO)} > 0",
            _hot_index=hot_index,
            _channel_number=channel_number,
        )
        with_channel_id = f"{_below('bid.has_channel_id', 10, key='_channel_number')} > 0"
        cold_url = (
            f"concat({_base_url('_channel_number')}, "
            f"IF({with_channel_id}, concat('&channel_id=', {_channel_id('_channel_number')}), ''))"
        )
        df = stage(
            df,
            channel=f"IF(_hot_channel, element_at(array({hot_channels}), _hot_index), "
            f"concat('channel-', _channel_number))",
            url=f"IF(_hot_channel, element_at(array({hot_urls}), _hot_index), {cold_url})",
            _extra_size=_extra_size("bid.extra.size", "32", AVG_BID_BYTES),
        )
        df = stage(df, extra=_exact_string("bid.extra", "_extra_size"))

    return df.select(*[name for name, _ in TABLE_COLUMNS[config.table]])
