"""Where stores live: the lock, spill columns, journal, block runner, transactions and publishing."""
