"""The HTTP ingress: runs over HTTP and Server-Sent Events for clients that do not speak NATS.

A separate process and a plain bus client (`runbus.client.RunbusClient`): it imports nothing of
the gateway service, and a run it started lives on the bus, not in this process.
"""
