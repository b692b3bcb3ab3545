"""The Spark engine (``runtime.spark.engine``) and its parts.

PySpark warns, at import and for every pandas UDF, that it "does not yet fully
support" the installed pandas. The engine is tested on that pandas, so the warning is
filtered here, before any part imports PySpark (``session.py`` passes the same filter
to the Python workers through ``PYTHONWARNINGS``).
"""
import warnings

PANDAS_WARNING = "PySpark does not yet fully support pandas"
warnings.filterwarnings("ignore", message=PANDAS_WARNING, category=FutureWarning)
