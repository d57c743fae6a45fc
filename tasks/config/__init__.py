"""Configs: reading and checking them (``load``), the table of every key and its status (``key_table``) and its
checks (``keys``), the registry scopes (``scopes``), and mmengine's ``mmdet::`` / ``mmseg::`` lookups kept per
process (``packages``)."""
