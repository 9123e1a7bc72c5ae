"""Send the demo's mix of orders and payments to a running shop worker.

    REDIS_URL=redis://localhost:6379/0 python -m examples.send

(``docker compose exec worker python -m examples.send`` with docker-compose.yml.)
Prints each task id; watch them in the worker's log, in Flower, and with
``celery -A examples.shop dlq list`` once they are dead-lettered.
"""
from examples.demo import SCENARIO
from examples.shop import app

if __name__ == "__main__":
    for label, name, args, kwargs, expected in SCENARIO:
        result = app.send_task(name, args=args, kwargs=kwargs)
        print(f"{result.id}  {label:<22} {expected}")
