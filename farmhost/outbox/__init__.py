"""The outbox anyone in the host uses to tell a chat something: notices, chunking, the messages/ queue's handlers."""
