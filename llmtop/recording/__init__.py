"""Recording sessions and reading them back: the JSON Lines writer (``writer``), the
streaming reader (``reader``), replay through the live aggregation code (``replay``),
reports (``report``) and exports to Parquet and HdrHistogram logs (``export``).

Import from the submodules; this package imports nothing heavy on its own.
"""
