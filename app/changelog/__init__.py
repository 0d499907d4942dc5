"""The change log: the outbox and all of its SQL, the sequencer and relay, the change feed, feed readers' positions,
and what a change means (the entity change events the write path publishes and the timeline reports)."""
