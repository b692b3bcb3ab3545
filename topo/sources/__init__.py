"""Offset-addressable sources both engines read, and the spouts that name them.

* ``topo.sources.log``: the partitioned message log (``MD5(key) mod numPartitions``),
  embedded file-backed or on Redis Streams;
* ``topo.sources.synthetic``: rate profiles (constant, bursty), deterministic by offset;
* ``topo.sources.spouts``: ``MessageLogSpout`` and ``SyntheticSpout`` for topologies;
* ``topo.sources.files``: text, JSON lines and CSV file spouts with byte offsets (local engine);
* ``topo.sources.redis_streams``: a Redis stream through a consumer group (local engine).
"""
from topo.sources.base import OffsetSource
from topo.sources.files import CsvSpout, FileSpout, JsonLinesSpout, TextFileSpout
from topo.sources.redis_streams import RedisStreamSpout
from topo.sources.log import FileLog, RedisLog, open_log, partition_for
from topo.sources.spouts import MessageLogSpout, OffsetSpout, SyntheticSpout
from topo.sources.synthetic import Bursty, Constant, SyntheticSource, make_profile

__all__ = ["OffsetSource", "FileLog", "RedisLog", "open_log", "partition_for", "MessageLogSpout",
           "OffsetSpout", "SyntheticSpout", "Bursty", "Constant", "SyntheticSource", "make_profile",
           "FileSpout", "TextFileSpout", "JsonLinesSpout", "CsvSpout", "RedisStreamSpout"]
