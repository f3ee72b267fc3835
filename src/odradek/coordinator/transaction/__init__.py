"""The transaction coordinator (Kafka's `coordinator/transaction/`): reserved.

Idempotent and transactional producers are not implemented yet. When they are, this package takes
the shape of `coordinator/group/`: the API-facing coordinator, the transaction state manager on
`__transaction_state`, the transaction metadata and its valid transitions, and the channel that
sends transaction markers to partition leaders.
"""
