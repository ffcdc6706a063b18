package engine

import (
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/tokens"
	"github.com/postern-dev/postern/bastion/transport"
)

// TokenViews are the remote actors' credentials as `postern token list` shows them: the
// issued tokens at now, oldest first, then each remote actor's static config token.
// lastUsed, when not nil, is the HTTP endpoint's last acceptance of each (by id).
func TokenViews(cfg config.Config, issued []tokens.Token, now time.Time, lastUsed func(id string) time.Time) *api.TokenList {
	remote := map[string]bool{}
	for _, a := range cfg.Actors {
		if !a.Local() {
			remote[a.Name] = true
		}
	}
	used := func(id string) time.Time {
		if lastUsed == nil {
			return time.Time{}
		}
		return lastUsed(id)
	}
	list := &api.TokenList{Tokens: []api.TokenView{}}
	for _, t := range issued {
		v := IssuedTokenView(t, now)
		v.LastUsed = used(t.ID)
		if !remote[t.Actor] && v.State == string(tokens.Active) {
			v.Note = "refused: the config has no remote actor " + t.Actor
		}
		list.Tokens = append(list.Tokens, v)
	}
	for _, a := range cfg.Actors {
		if a.TokenSHA256 != "" {
			id := transport.StaticID(a.Name)
			list.Tokens = append(list.Tokens, api.TokenView{ID: id, Actor: a.Name, Source: "config", State: string(tokens.Active), LastUsed: used(id)})
		}
	}
	return list
}

// IssuedTokenView is an issued token as the operator API shows it (no last use).
func IssuedTokenView(t tokens.Token, now time.Time) api.TokenView {
	return api.TokenView{
		ID: t.ID, Actor: t.Actor, Source: "issued", State: string(t.StateAt(now)),
		Created: t.Created, CreatedBy: t.CreatedBy, Expires: t.Expires, Revoked: t.Revoked, RevokedBy: t.RevokedBy,
	}
}

// Tokens answers postern token list while the daemon is down: the store file as it is,
// without last uses (servingEngine answers it for a serving daemon).
func (e *Engine) Tokens() (*api.TokenList, error) {
	issued, err := tokens.Load(e.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	return TokenViews(e.Config(), issued, e.now(), nil), nil
}

// IssueToken answers postern token NAME while the daemon is down: only the daemon issues.
func (e *Engine) IssueToken(api.Operator, api.TokenRequest) (*api.IssuedToken, error) {
	return nil, &api.ToolError{Code: api.CodeBastionDown, Message: "the bastion is not running: it issues tokens (and checks them); start it, or print a static config token with postern token --static NAME"}
}

// RevokeToken answers postern token revoke while the daemon is down.
func (e *Engine) RevokeToken(api.Operator, string) (*api.TokenRevocation, error) {
	return nil, &api.ToolError{Code: api.CodeBastionDown, Message: "the bastion is not running: postern token revoke changes its token store under the state dir's lock instead"}
}
