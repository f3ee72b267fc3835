"""The transaction coordinator (Kafka's `coordinator/transaction/`).

`producer_id_manager` hands out producer ids in blocks reserved in ZooKeeper (idempotent
producers use it through InitProducerId). Transactional producers are not implemented yet. When
they are, this package takes the shape of `coordinator/group/`: the API-facing coordinator, the transaction state manager on
`__transaction_state`, the transaction metadata and its valid transitions, and the channel that
sends transaction markers to partition leaders.
"""
