"""The change log: the outbox and all of its SQL, the sequencer and relay, the change feed, and feed readers' positions."""
