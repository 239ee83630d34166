"""layby: durable interrupts for LLM agent runs on Celery and Redis/Valkey."""
