package config

import (
	"fmt"
	"net/url"
	"os/user"
	"strconv"
)

// validate reports every problem of the [approvals] table.
func (a Approvals) validate() []error {
	var errs []error
	for i, name := range a.Operators {
		if _, err := lookupUID(name); err != nil {
			errs = append(errs, fmt.Errorf("config: approvals.operators[%d]: %w", i, err))
		}
	}
	if a.Webhook != "" {
		u, err := url.Parse(a.Webhook)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, fmt.Errorf("config: approvals.webhook: want an http(s) URL, got %q", a.Webhook))
		} else if u.User != nil {
			errs = append(errs, fmt.Errorf("config: approvals.webhook: put no credentials in the URL (they would be logged); sign with webhook_secret_file"))
		}
	}
	if a.WebhookSecretFile != "" && a.Webhook == "" {
		errs = append(errs, fmt.Errorf("config: approvals.webhook_secret_file is set without a webhook"))
	}
	return errs
}

// OperatorUIDs resolves Operators to uids; nil when none are named (the default rule
// applies). Names are looked up now, so a user created or renamed since the config was
// loaded counts as it is now.
func (a Approvals) OperatorUIDs() ([]int, error) {
	var uids []int
	for _, name := range a.Operators {
		uid, err := lookupUID(name)
		if err != nil {
			return nil, fmt.Errorf("approvals.operators: %w", err)
		}
		uids = append(uids, uid)
	}
	return uids, nil
}

// lookupUID is a local user's uid, by name or as a number.
func lookupUID(name string) (int, error) {
	if uid, err := strconv.Atoi(name); err == nil && uid >= 0 {
		return uid, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return 0, fmt.Errorf("no local user %q (give a user name or a numeric uid)", name)
	}
	return strconv.Atoi(u.Uid)
}
