package etcdjournal

// SetIndexed makes List read as a journal without the actor and run indexes does (scanning
// the time index): the baseline of BenchmarkListByActor.
func (j *Journal) SetIndexed(v bool) { j.indexed.Store(v) }
