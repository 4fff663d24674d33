package client

import (
	"context"
	"fmt"
	"net/http"

	"github.com/metnos/agent/wire"
)

// ComponentDescriptor fetches the signed update descriptor of a
// component's build for a target (GET
// /agent/component/<component>/update/<target>, docs/protocol.md §9),
// as the server sent it: check it with [wire.VerifyComponentDescriptor].
// A server that publishes none answers 404 (no_manifest, no_binary):
// see [StatusOf].
func (c *Client) ComponentDescriptor(ctx context.Context, component, target string) ([]byte, error) {
	if !wire.ValidComponent(component) || !wire.ValidTarget(target) {
		return nil, fmt.Errorf("update descriptor: %q for %q is not a component and target the server can publish", component, target)
	}
	b, err := c.do(ctx, http.MethodGet, wire.PathComponent+component+"/update/"+target, nil, false, FetchTimeout, smallAnswer)
	if err != nil {
		return nil, fmt.Errorf("update descriptor: %w", err)
	}
	return b, nil
}

// FileURL is the URL of a file the server's mirror serves at urlPath
// (a descriptor's url_path, which starts with /agent/client/).
func (c *Client) FileURL(urlPath string) string { return c.base + urlPath }
