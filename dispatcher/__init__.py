"""outbox-dispatcher"""
