"""Parked retries: a failed message parked for its next delivery, and moved back when due."""
