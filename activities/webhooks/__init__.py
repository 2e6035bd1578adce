"""Webhook notifications (httpx): the outside world Rebound tells about incidents and actions."""
