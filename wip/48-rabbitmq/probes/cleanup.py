"""Delete the probes' leftover queues, named on the command line (from `rabbitmqctl list_queues | grep probe48`)."""
import sys

from common import connect

conn = connect()
for q in sys.argv[1:]:
    if q.startswith("probe48."):
        conn.channel().queue_delete(q)
conn.close()
