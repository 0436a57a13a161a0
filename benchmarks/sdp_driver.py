"""Spark Declarative Pipelines side of bench_views.py; not run by hand.

Started by bench_views.py the way `spark-pipelines` starts its own CLI:

    $SPARK_HOME/bin/spark-class org.apache.spark.deploy.SparkPipelines sdp_driver.py CONFIG.json

so a local Spark Connect server and this client run as in `spark-pipelines run`. What the CLI's
`run` does once per process (load the spec, create a dataflow graph, register the definitions,
start a run, stream its events) is done here once per refresh, on one session, so every refresh
after the first finds a warm server, as Epochal's epochs find a warm SparkSession:

1. external tables t and d over the initial Parquet state; a run of every materialized view;
2. for each change: t is pointed at the changed state (ALTER TABLE ... SET LOCATION, the same
   rows Epochal's source holds after the change), then each view is refreshed alone
   (`--refresh <view>`), and the run timed from StartRun to the run's last event.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> int:
    from pyspark.pipelines import cli
    from pyspark.pipelines.spark_connect_graph_element_registry import SparkConnectGraphElementRegistry
    from pyspark.pipelines.spark_connect_pipeline import create_dataflow_graph, start_run
    from pyspark.sql import SparkSession

    config = json.loads(Path(sys.argv[1]).read_text())
    spec_path = Path(config["spec"])
    spec = cli.load_pipeline_spec(spec_path)
    builder = SparkSession.builder.config("spark.sql.connect.serverStacktrace.enabled", "false")
    for key, value in spec.configuration.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    print(f"[sdp] spark {spark.version}", flush=True)

    def pipeline_run(refresh: list[str]) -> dict:
        started = time.perf_counter()
        graph = create_dataflow_graph(
            spark, default_catalog=spec.catalog, default_database=spec.database, sql_conf=spec.configuration
        )
        registry = SparkConnectGraphElementRegistry(spark, graph)
        cli.register_definitions(spec_path, registry, spec, spark, graph)
        registered = time.perf_counter()
        events = []
        for result in start_run(
            spark, graph, full_refresh=[], full_refresh_all=False, refresh=refresh, dry=False, storage=spec.storage
        ):
            if "pipeline_event_result" not in result:
                continue
            event = result["pipeline_event_result"].event
            ts = event.timestamp.seconds + event.timestamp.nanos / 1e9
            events.append((ts, event.message))
            print(f"[sdp] {ts:.3f} {event.message}", flush=True)
        finished = time.perf_counter()
        if not any("Run is COMPLETED" in m for _, m in events):
            raise RuntimeError("pipeline run did not complete: " + " | ".join(m for _, m in events[-5:]))
        flows = {}
        for name in refresh or config["views"]:
            running = [ts for ts, m in events if name in m and "is RUNNING" in m]
            done = [ts for ts, m in events if name in m and "has COMPLETED" in m]
            if running and done:
                flows[name] = done[-1] - running[0]
        return {
            "register_s": registered - started,
            "run_s": finished - registered,  # StartRun until the event stream ends
            "events_s": events[-1][0] - events[0][0] if events else None,
            "flow_s": flows,
        }

    spark.sql("DROP TABLE IF EXISTS t")
    spark.sql("DROP TABLE IF EXISTS d")
    spark.sql(f"CREATE TABLE t USING parquet LOCATION '{config['initial_state']}'")
    spark.sql(f"CREATE TABLE d USING parquet LOCATION '{config['d']}'")
    result: dict = {"spark": spark.version, "views": config["views"]}
    initial = pipeline_run([])
    result["initial_run_s"] = initial["run_s"]
    result["initial"] = initial
    refreshes = []
    for change in config["changes"]:
        spark.sql(f"ALTER TABLE t SET LOCATION '{change['state']}'")
        spark.sql("REFRESH TABLE t")
        for view in config["views"]:
            timing = pipeline_run([view])
            refreshes.append({"view": view, "fraction": change["fraction"], **timing})
    result["refresh"] = refreshes
    Path(config["out"]).write_text(json.dumps(result, indent=1))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
