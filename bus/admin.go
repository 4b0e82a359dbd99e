package bus

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/policy/adminwire"
)

// Override replaces, for the checks of one namespace whose identifier
// matches Identifier, the limit and duration they carry (README, "Overrides and shadow mode").
// Identifier is a pattern: an exact identifier, or bytes where each '*'
// matches any run of bytes ("user_*", "org:*:admin"; "*" alone covers the
// namespace). The pattern is the override's identity in its namespace (no
// other id exists): get and delete take it exactly as set. Of the patterns
// that match a check, the most specific applies (policy.ComparePatterns):
// the exact one, else the one with the most literal bytes, so the longest
// prefix among prefixes; the check's reply names it (CheckResponse.Override).
// With Shadow, the checks it covers are counted as if enforced and a denial
// is answered Success with ShadowDenied.
type Override = adminwire.Override

// SetOverride sets o in workspace (replacing the override of the same
// namespace and pattern) and returns it as stored. Errors are as for Check:
// a *ServiceError with code 400 says what is wrong with o (a bad pattern, a
// value out of range, a workspace at its maximum of overrides), and
// nothing was changed.
func (c *Client) SetOverride(ctx context.Context, workspace string, o Override) (Override, error) {
	return adminCall(ctx, c, workspace, adminwire.OpSet, adminwire.SetRequest{Namespace: o.Namespace,
		Identifier: o.Identifier, Limit: o.Limit, Duration: o.Duration, Shadow: o.Shadow}.Append(nil, c.enc),
		"override.set", adminwire.DecodeOverride)
}

// DeleteOverride deletes the override of namespace and pattern in
// workspace. Deleting a pattern that has no override is a *ServiceError
// with code 400.
func (c *Client) DeleteOverride(ctx context.Context, workspace, namespace, pattern string) error {
	_, err := adminCall(ctx, c, workspace, adminwire.OpDelete,
		adminwire.DeleteRequest{Namespace: namespace, Identifier: pattern}.Append(nil, c.enc),
		"override.delete", func([]byte, Encoding) (struct{}, error) { return struct{}{}, nil })
	return err
}

// GetOverride returns the override of namespace and pattern in workspace
// as stored. The pattern is matched exactly as it was set ("user_*" is the
// prefix override, not the overrides it would match). A pattern with no
// override is a *ServiceError with code 400 saying "no such override".
func (c *Client) GetOverride(ctx context.Context, workspace, namespace, pattern string) (Override, error) {
	return adminCall(ctx, c, workspace, adminwire.OpGet,
		adminwire.GetRequest{Namespace: namespace, Identifier: pattern}.Append(nil, c.enc),
		"override.get", adminwire.DecodeOverride)
}

// ListOverrides returns every override of workspace, of namespace only
// unless it is empty, ordered by namespace and pattern: it asks for pages
// (ListOverridesPage) until the last. Each page is read at one instant;
// overrides set or deleted while it pages may or may not be in the result,
// and every other one is in it exactly once. Without a deadline on ctx,
// each page has the client's timeout.
func (c *Client) ListOverrides(ctx context.Context, workspace, namespace string) ([]Override, error) {
	var all []Override
	cursor := ""
	for {
		page, next, err := c.ListOverridesPage(ctx, workspace, namespace, cursor, 0)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next == "" {
			if all == nil {
				all = []Override{}
			}
			return all, nil
		}
		if len(page) == 0 || next == cursor {
			return nil, fmt.Errorf("list overrides of %s: the limiter answered a page that does not move on (%d overrides, next %q)", workspace, len(page), next)
		}
		cursor = next
	}
}

// ListOverridesPage returns one page of the overrides of workspace (of
// namespace only unless it is empty), ordered by namespace and pattern:
// those after cursor ("" for the first page, else the next a previous call
// returned, with the same namespace), at most limit of them (1 to
// adminwire.MaxListLimit; 0: the limiter's default, 1000). A page may hold
// fewer than limit, so that its reply fits in a NATS message; next is the
// cursor of the page that follows, "" when this page is the last. A bad
// cursor or limit is a *ServiceError with code 400.
func (c *Client) ListOverridesPage(ctx context.Context, workspace, namespace, cursor string, limit int) (page []Override, next string, err error) {
	var req []byte
	if namespace != "" || cursor != "" || limit != 0 {
		req = adminwire.ListRequest{Namespace: namespace, Cursor: cursor, Limit: limit}.Append(nil, c.enc)
	}
	l, err := adminCall(ctx, c, workspace, adminwire.OpList, req, "override.list", adminwire.DecodeListResponse)
	return l.Overrides, l.Next, err // both zero on error
}

// Reset forgets the usage of identifier in namespace of workspace, for
// duration (milliseconds) or, when it is 0, for every duration, in every
// region (README, "Overrides and shadow mode"): the checks that follow start from zero, current
// and previous window alike. It returns the reset's epoch (unix ms, by the
// clock of the limiter that took it). Errors are as for Check: a
// *ServiceError with code 400 says what is wrong (a duration out of range,
// an empty identifier), and nothing was reset. The identifier is literal:
// a '*' is just a byte.
func (c *Client) Reset(ctx context.Context, workspace, namespace, identifier string, duration int64) (int64, error) {
	r, err := adminCall(ctx, c, workspace, adminwire.OpReset, adminwire.ResetRequest{Namespace: namespace,
		Identifier: identifier, Duration: duration}.Append(nil, c.enc), "reset", adminwire.DecodeResetResponse)
	return r.Reset, err // zero on error
}

// adminCall sends body to op's subject in workspace and returns the reply
// decoded with decode, as requestDecoded does.
func adminCall[T any](ctx context.Context, c *Client, workspace string, op adminwire.Op, body []byte, what string,
	decode func([]byte, Encoding) (T, error)) (T, error) {
	if err := wire.CheckTokens(workspace); err != nil {
		var zero T
		return zero, err
	}
	return requestDecoded(ctx, c, adminwire.Subject(c.subjects.Base(), workspace, op), body, what,
		func(e Encoding, b []byte) (T, error) { return decode(b, e) })
}
