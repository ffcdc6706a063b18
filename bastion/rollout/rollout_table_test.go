package rollout

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/datadriven"
)

// The brakes as tables (internal/datadriven; -rewrite regenerates them): testdata/rollout.
//
// Commands:
//
//	limits  total= max_concurrency= max_errors=      ParseLimit, Concurrency, Of
//	rollout max_concurrency= max_errors= ends=ok,fail,… [cancel_after=N]
//	        a run of one host per end, driven by Next: the hosts end in the order they
//	        started, each as ends says; cancel_after cancels the run after N ends
func TestRolloutTables(t *testing.T) {
	datadriven.RunDir(t, filepath.Join("testdata"), func(t *testing.T, c datadriven.Case) string {
		limit := func(key string) Limit {
			l, err := ParseLimit(c.Args[key])
			if err != nil {
				c.Fatalf(t, "%s=: %v", key, err)
			}
			return l
		}
		switch c.Name {
		case "limits":
			total, err := strconv.Atoi(c.Args["total"])
			if err != nil {
				c.Fatalf(t, "total=: %v", err)
			}
			conc, errs := limit("max_concurrency"), limit("max_errors")
			return fmt.Sprintf("%d at once, %d failures tolerated", Concurrency(conc, total), errs.Of(total))
		case "rollout":
			ends := strings.Split(c.Args["ends"], ",")
			cancelAfter := -1
			if v, ok := c.Args["cancel_after"]; ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					c.Fatalf(t, "cancel_after=: %v", err)
				}
				cancelAfter = n
			}
			return simulate(ends, Concurrency(limit("max_concurrency"), len(ends)), limit("max_errors").Of(len(ends)), cancelAfter)
		}
		c.Fatalf(t, "unknown command %q", c.Name)
		return ""
	})
}

// simulate drives a run with Next as a fleet run's driver does, one host ending at a time
// (the oldest running one), and writes what happened, one step a line.
func simulate(ends []string, conc, tolerated, cancelAfter int) string {
	p := Progress{Total: len(ends)}
	var lines, running []string
	braked := false
	for ended := 0; ; {
		step := Next(p, conc, tolerated)
		if step.Braked && !braked {
			braked = true
			lines = append(lines, "braked: no new host starts")
		}
		if step.Start > 0 {
			var names []string
			for range step.Start {
				names = append(names, "h"+strconv.Itoa(p.Started+1))
				running = append(running, names[len(names)-1])
				p.Started++
				p.Running++
			}
			lines = append(lines, "start "+strings.Join(names, " "))
			continue
		}
		if step.Done {
			lines = append(lines, fmt.Sprintf("%s: %d of %d hosts started, %d failed", step.Outcome, p.Started, p.Total, p.Failed))
			return strings.Join(lines, "\n")
		}
		h := running[0]
		running = running[1:]
		p.Running--
		i, _ := strconv.Atoi(strings.TrimPrefix(h, "h"))
		if ends[i-1] == "ok" {
			p.Succeeded++
		} else {
			p.Failed++
		}
		lines = append(lines, h+" "+ends[i-1])
		ended++
		if ended == cancelAfter {
			p.Cancelled = true
			lines = append(lines, "cancel")
		}
	}
}
