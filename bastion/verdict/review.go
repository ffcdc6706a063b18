package verdict

import "github.com/postern-dev/postern/markers"

// Reviewable reports whether an operator may record the outcome of an execution in state:
// one whose outcome is unknown, or one in flight (dispatched, running) that no driver carries
// any more — its driver stopped, for instance on a failed journal write, so nothing else
// would ever settle it.
func Reviewable(state markers.State, driven bool) bool {
	switch state {
	case markers.Unknown:
		return true
	case markers.Dispatched, markers.Running:
		return !driven
	}
	return false
}
