"""The kopf operator for OutboxDispatcher resources."""
