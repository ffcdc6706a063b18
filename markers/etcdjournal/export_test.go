package etcdjournal

// SetIndexed makes List read as a journal without the actor and run indexes does (scanning
// the time index): the baseline of BenchmarkListByActor.
func (j *Journal) SetIndexed(v bool) { j.indexed.Store(v) }

// ChainTxns is how many chain transactions this replica sent and how many of them lost the
// head to another replica: BenchmarkChainContention's measure.
func (j *Journal) ChainTxns() (sent, lostHead uint64) { return j.txns.Load(), j.lostHead.Load() }
