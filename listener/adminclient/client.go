// Package adminclient talks to a running listener's admin API over its
// unix socket; the stratum-listener subcommands and the tests use it.
package adminclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/registry"
)

// DefaultSocket is where the packaged unit puts the admin socket.
const DefaultSocket = "/run/stratum/admin.sock"

// SocketFromEnv returns $STRATUM_ADMIN_SOCKET or the default.
func SocketFromEnv() string {
	if s := os.Getenv("STRATUM_ADMIN_SOCKET"); s != "" {
		return s
	}
	return DefaultSocket
}

// Client is an admin API client.
type Client struct {
	http   *http.Client
	base   string
	socket string
}

// New returns a client for the unix socket at path; each request may take
// up to 6 minutes (see WithTimeout).
func New(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}
	return &Client{http: &http.Client{Transport: tr, Timeout: 6 * time.Minute}, base: "http://stratum-admin", socket: path}
}

// WithTimeout bounds each request to d: past it the request fails with
// ErrTimeout.
func (c *Client) WithTimeout(d time.Duration) *Client {
	if d > 0 {
		c.http.Timeout = d
	}
	return c
}

// ProblemError is an error answer of the API.
type ProblemError struct{ adminapi.Problem }

// Transient reports whether the listener answered that it cannot serve
// the request now (503: its store did not answer, is full or damaged) and
// the same request may succeed later.
func (e *ProblemError) Transient() bool { return e.Status == http.StatusServiceUnavailable }

func (e *ProblemError) Error() string {
	msg := fmt.Sprintf("%s: %s", e.Code, e.Detail)
	for _, f := range e.Errors {
		msg += fmt.Sprintf("\n  %s: %s", f.Field, f.Message)
	}
	return msg
}

// ErrUnreachable means the socket could not be reached.
var ErrUnreachable = errors.New("cannot reach the listener's admin socket")

// ErrTimeout means the listener did not answer within the client's
// timeout.
var ErrTimeout = errors.New("the listener did not answer in time")

// connError names the socket and the likely cause, not the request's URL
// (the host in it is a placeholder the socket dialer ignores). A
// permission error still matches fs.ErrPermission.
func (c *Client) connError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	switch {
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("admin socket %s: %w: only root may use it (run as root, or with sudo)", c.socket, fs.ErrPermission)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%w %s: no listener is running there (start stratum-listener.socket, or give --admin-socket)", ErrUnreachable, c.socket)
	}
	return fmt.Errorf("%w %s: %w", ErrUnreachable, c.socket, err)
}

// Do sends a request and decodes the JSON answer into out.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
		return fmt.Errorf("%w (%s): %s %s", ErrTimeout, c.http.Timeout, method, path)
	}
	if err != nil {
		return c.connError(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var p ProblemError
		if json.Unmarshal(b, &p.Problem) != nil || p.Code == "" {
			if resp.StatusCode == http.StatusServiceUnavailable {
				p.Problem = adminapi.Problem{Status: resp.StatusCode, Code: adminapi.CodeUnavailable, Detail: resp.Status}
				return &p
			}
			return fmt.Errorf("admin api: %s", resp.Status)
		}
		return &p
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// Backup streams a backup of the listener's store into w (a bbolt file).
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/admin/cluster/store/backup", nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.http.Do(req)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
		return 0, fmt.Errorf("%w (%s): store backup", ErrTimeout, c.http.Timeout)
	}
	if err != nil {
		return 0, c.connError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var p ProblemError
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &p.Problem) != nil || p.Code == "" {
			return 0, fmt.Errorf("admin api: %s", resp.Status)
		}
		return 0, &p
	}
	n, err := io.Copy(w, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("the backup was cut short: %d of %d bytes", n, resp.ContentLength)
	}
	return n, err
}

type items[T any] struct {
	Items []T `json:"items"`
}

// MintCode mints a join code.
func (c *Client) MintCode(ctx context.Context, req adminapi.MintCodeRequest) (adminapi.Code, error) {
	var out adminapi.Code
	err := c.Do(ctx, http.MethodPost, "/v1/admin/cluster/join-codes", req, &out)
	return out, err
}

// ResetAttempts forgets the failed attempts of a live join code.
func (c *Client) ResetAttempts(ctx context.Context, id string) (adminapi.Code, error) {
	var out adminapi.Code
	err := c.Do(ctx, http.MethodPost, "/v1/admin/cluster/join-codes/"+url.PathEscape(id)+"/reset-attempts", nil, &out)
	return out, err
}

// Codes lists join codes, newest first.
//
// With labels (each KEY=VALUE), only the codes that carry all of them.
func (c *Client) Codes(ctx context.Context, labels ...string) ([]adminapi.Code, error) {
	var out items[adminapi.Code]
	path := "/v1/admin/cluster/join-codes"
	if len(labels) > 0 {
		path += "?" + url.Values{"label": labels}.Encode()
	}
	err := c.Do(ctx, http.MethodGet, path, nil, &out)
	return out.Items, err
}

// Code shows one code.
func (c *Client) Code(ctx context.Context, id string) (adminapi.Code, error) {
	var out adminapi.Code
	err := c.Do(ctx, http.MethodGet, "/v1/admin/cluster/join-codes/"+url.PathEscape(id), nil, &out)
	return out, err
}

// RevokeCode revokes a code.
func (c *Client) RevokeCode(ctx context.Context, id string) (adminapi.Code, error) {
	var out adminapi.Code
	err := c.Do(ctx, http.MethodPost, "/v1/admin/cluster/join-codes/"+url.PathEscape(id)+"/revoke", nil, &out)
	return out, err
}

// Nodes lists nodes.
func (c *Client) Nodes(ctx context.Context) ([]adminapi.NodeView, error) {
	var out items[adminapi.NodeView]
	err := c.Do(ctx, http.MethodGet, "/v1/admin/cluster/nodes", nil, &out)
	return out.Items, err
}

// Node shows one node.
func (c *Client) Node(ctx context.Context, id string) (adminapi.NodeView, error) {
	var out adminapi.NodeView
	err := c.Do(ctx, http.MethodGet, "/v1/admin/cluster/nodes/"+url.PathEscape(id), nil, &out)
	return out, err
}

// RevokeNode revokes a node.
func (c *Client) RevokeNode(ctx context.Context, id string) (adminapi.NodeView, error) {
	var out adminapi.NodeView
	err := c.Do(ctx, http.MethodPost, "/v1/admin/cluster/nodes/"+url.PathEscape(id)+"/revoke", nil, &out)
	return out, err
}

// Joins lists joins, pending first.
func (c *Client) Joins(ctx context.Context) ([]cluster.Join, error) {
	var out items[cluster.Join]
	err := c.Do(ctx, http.MethodGet, "/v1/admin/cluster/joins", nil, &out)
	return out.Items, err
}

// Join shows one join, with its SAS while it is pending.
func (c *Client) Join(ctx context.Context, id string) (cluster.Join, error) {
	var out cluster.Join
	err := c.Do(ctx, http.MethodGet, "/v1/admin/cluster/joins/"+url.PathEscape(id), nil, &out)
	return out, err
}

// DecideJoin approves or refuses a pending join. sas, when not empty, must
// be the join's short authentication string, or the approval is refused
// (JOIN_APPROVAL_REFUSED) and the join stays pending.
func (c *Client) DecideJoin(ctx context.Context, id string, approve bool, sas string) (cluster.Join, error) {
	verb := "refuse"
	if approve {
		verb = "approve"
	}
	var body any
	if sas != "" {
		body = adminapi.DecideJoinRequest{SAS: sas}
	}
	var out cluster.Join
	err := c.Do(ctx, http.MethodPost, "/v1/admin/cluster/joins/"+url.PathEscape(id)+"/"+verb, body, &out)
	return out, err
}

// CA shows the cluster CA.
func (c *Client) CA(ctx context.Context) (adminapi.CAView, error) {
	var out adminapi.CAView
	err := c.Do(ctx, http.MethodGet, "/v1/admin/cluster/ca", nil, &out)
	return out, err
}

// RotateCA rotates the cluster CA.
func (c *Client) RotateCA(ctx context.Context) (adminapi.CAView, error) {
	var out adminapi.CAView
	err := c.Do(ctx, http.MethodPost, "/v1/admin/cluster/ca/rotate", nil, &out)
	return out, err
}

// RetireCA ends every root but the current one and revokes what was
// minted under them.
func (c *Client) RetireCA(ctx context.Context) (adminapi.RetireView, error) {
	var out adminapi.RetireView
	err := c.Do(ctx, http.MethodPost, "/v1/admin/cluster/ca/retire", nil, &out)
	return out, err
}

// Events lists events after seq; wait > 0 long-polls for new ones.
func (c *Client) Events(ctx context.Context, after string, wait time.Duration) ([]cluster.Event, error) {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	var out items[cluster.Event]
	err := c.Do(ctx, http.MethodGet, "/v1/admin/cluster/events?"+q.Encode(), nil, &out)
	return out.Items, err
}

// CreateAPIKey creates an API key for the HTTPS admin API; the returned
// view's Key is the bearer secret, shown only this once.
func (c *Client) CreateAPIKey(ctx context.Context, req adminapi.APIKeyRequest) (adminapi.APIKeyView, error) {
	var out adminapi.APIKeyView
	err := c.Do(ctx, http.MethodPost, "/v1/admin/api-keys", req, &out)
	return out, err
}

// APIKeys lists API keys (never their secrets).
func (c *Client) APIKeys(ctx context.Context) ([]adminapi.APIKeyView, error) {
	var out items[adminapi.APIKeyView]
	err := c.Do(ctx, http.MethodGet, "/v1/admin/api-keys", nil, &out)
	return out.Items, err
}

// RevokeAPIKey revokes an API key at once.
func (c *Client) RevokeAPIKey(ctx context.Context, id string) (adminapi.APIKeyView, error) {
	var out adminapi.APIKeyView
	err := c.Do(ctx, http.MethodPost, "/v1/admin/api-keys/"+url.PathEscape(id)+"/revoke", nil, &out)
	return out, err
}

// Registry shows the listener's registry.
func (c *Client) Registry(ctx context.Context) (registry.Registry, error) {
	var out registry.Registry
	err := c.Do(ctx, http.MethodGet, "/v1/admin/registry", nil, &out)
	return out, err
}
