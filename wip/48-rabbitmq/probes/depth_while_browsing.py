"""What an exporter reading a DLQ's depth (queue.declare passive: message_count) sees while a browser
holds letters to read them (issue 48, design (c)): 10 letters, 5 held unacknowledged."""
import json

from common import connect, nack, name, publish_confirmed

conn = connect()
browser, exporter = conn.channel(), conn.channel()
q = name("depth")
browser.queue_declare(q, durable=True, auto_delete=False)
publish_confirmed(conn.channel(), q, 10)
before = exporter.queue_declare(q, passive=True)[1]
held = [browser.basic_get(queue=q, no_ack=False) for _ in range(5)]
during = exporter.queue_declare(q, passive=True)[1]
nack(browser, held[-1].delivery_tag)
browser.basic_qos(0, 0, False)   # a round trip on the browser's channel after the nack
after = exporter.queue_declare(q, passive=True)[1]
exporter.queue_delete(q)
conn.close()
print(json.dumps({"depth_before": before, "depth_while_5_held": during, "depth_after_requeue": after}))
