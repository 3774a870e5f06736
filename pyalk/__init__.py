"""pyalk: job queues, streams, outbox, locks and a scheduler that live inside
PostgreSQL as versioned SQL functions; this package binds them."""
