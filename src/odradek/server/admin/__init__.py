"""Topic administration done by any broker for a client: creating, deleting and expanding topics
in ZooKeeper (`manager`, Kafka's AdminManager/AdminZkClient), the topic configs a broker
implements and their validation (`topics`), and the per-topic overrides every broker keeps current
from `/config/topics` (`topic_configs`).

The request handlers (`server.handlers_admin`, `server.handlers_configs`) call into this package;
nothing here imports the handlers, the request routing or the broker.
"""
