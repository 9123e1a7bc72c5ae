"""How evenly `{q:<queue>}` tags spread equally busy queues over 3 masters of equal slot ranges (no server)."""
import collections
import random

from redis.crc import key_slot


def per_master(names, masters=3):
    count = collections.Counter(key_slot(f"q:{n}".encode()) * masters // 16384 for n in names)
    return [count[i] for i in range(masters)]


print("q0..q11:", per_master([f"q{i}" for i in range(12)]))
rng = random.Random(1)
ratios = sorted(max(per_master([str(rng.random()) for _ in range(12)])) / 4 for _ in range(2000))
print("12 queues, random names, 2000 draws: max/mean median %.2f, within 1.2: %.0f%%"
      % (ratios[1000], 100 * sum(r <= 1.2 for r in ratios) / len(ratios)))
