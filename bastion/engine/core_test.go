package engine

// testCore puts co.cfg's settings in force (Open does it for a real engine).
func testCore(co *core) *core {
	s, err := newSettings(co.cfg)
	if err != nil {
		panic(err)
	}
	co.live.Store(s)
	return co
}
