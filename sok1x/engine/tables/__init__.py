"""Tables: one rank's shard of a dense or hash table (table), of a DynamicVariable
(dynamic_table), rows split between GPU and host memory (hybrid_rows), where a key's row lives
(placement), admission of new keys (admission), reading and writing rows by key (shard_rows,
assign_values) and the optimizer updates of a shard's rows and slots (optimizer_updates)."""
