"""The lookup: the all-to-all exchange of keys and vectors (key_exchange), the header that opens
every communicating op (exchange_header), pooled and keyed lookups (pooled, keyed), table groups
(table_group), the rows a backward pass made distinct (distinct_rows), the forward state kept for
the backward (stash), input checks (checks) and the per-step input guarantee (step_journal)."""
