package cluster

import "strings"

// Every store key of the cluster is built in this file, and only here:
// the admin facades and the listener reach the store through the typed
// methods of Cluster, never by key (test/arch checks it). Changing a key's
// shape is a schema change: bump SchemaVersion.
const (
	pfxSecret     = "secret/"   // secret/<id> -> Secret
	pfxLocator    = "locator/"  // locator/<locator> -> secret id
	pfxNode       = "node/"     // node/<id> -> Node
	pfxIdentity   = "identity/" // identity/<pool>/<identity key> -> node id (active nodes)
	pfxJoin       = "join/"     // join/<id> -> Join
	pfxJoinKey    = "joinkey/"  // joinkey/<secret id>/<key fingerprint> -> join id
	pfxEvent      = "event/"    // event/<seq> -> Event
	pfxSerial     = "serial/"   // serial/<cert serial> -> node id[#generation] (serialOwner)
	pfxAddr       = "addr/"     // addr/<network id>/<cidr> -> last address index handed out
	pfxAPIKey     = "apikey/"   // apikey/<id> -> APIKey
	pfxName       = "name/"     // name/<organization>/<join key name> -> secret id
	pfxCount      = "count/"    // count/joinkeys/<organization> -> how many join keys it holds
	pfxTokenIndex = "tokens/"   // tokens/<tenant>/<pool>/<id> -> token id (joinTokens listing)
	pfxKeyIndex   = "joinkeys/" // joinkeys/<organization>/<id> -> key id (join keys listing)
	pfxBudget     = "budget/"   // budget/<address> and budget/<prefix with _ for /> -> budgetEntry
	keyUnmatched  = "stats/last-unmatched-attempt"
	// keySharedIdentity holds the cluster's keys sealed under the
	// key-encryption key (package keyseal): never a key in clear.
	keySharedIdentity = "cluster/identity"
	pfxEndpoint       = "cluster/endpoint/" // cluster/endpoint/<host:port> -> host:port agents may dial
	keySchema         = "meta/schema-version"
)

func secretKey(id string) string            { return pfxSecret + id }
func locatorKey(locator string) string      { return pfxLocator + locator }
func nodeKey(id string) string              { return pfxNode + id }
func identityKey(pool, ident string) string { return pfxIdentity + pool + "/" + ident }
func joinKey(id string) string              { return pfxJoin + id }
func joinIndexKey(secretID, keyFP string) string {
	return pfxJoinKey + secretID + "/" + keyFP
}
func eventKey(seq string) string                  { return pfxEvent + seq }
func serialKey(serial string) string              { return pfxSerial + serial }
func addrKey(network, cidr string) string         { return pfxAddr + network + "/" + cidr }
func apiKeyKey(id string) string                  { return pfxAPIKey + id }
func keyNameKey(org, name string) string          { return pfxName + org + "/" + name }
func keyCountKey(org string) string               { return pfxCount + pfxKeyIndex + org }
func tokenIndexPrefix(tenant, pool string) string { return pfxTokenIndex + tenant + "/" + pool + "/" }
func keyIndexPrefix(org string) string            { return pfxKeyIndex + org + "/" }
func budgetKey(source string) string              { return pfxBudget + strings.ReplaceAll(source, "/", "_") }
func endpointKey(ep string) string                { return pfxEndpoint + ep }

// indexKeys are the listing keys that point at s: its pool's token list,
// or its organization's join key list.
func indexKeys(s *Secret) []string {
	switch {
	case s.Kind == KindToken:
		return []string{tokenIndexPrefix(s.Tenant, s.Pool) + s.ID}
	case s.Kind == KindKey && s.Key != nil:
		return []string{keyIndexPrefix(s.Key.OrgID) + s.ID}
	}
	return nil
}
