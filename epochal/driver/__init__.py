"""Small epochs computed on the driver by DuckDB and Python, exactly as Spark computes them, or not at all."""
