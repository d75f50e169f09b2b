package main

// The settings of envoyproxy/ratelimit that ratelimitd has, as flags named
// after them (REDIS_TLS is --redis-tls), and its environment variables read
// as such: a deployment's environment moves over as it is. A flag on the
// command line wins over RATELIMITD_<NAME>, which wins over the peer's
// <NAME>.

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
)

// compatFlags are the flags of the peer's settings, and what they set.
type compatFlags struct {
	keyLayout, configType string
}

func registerCompat(fs *flag.FlagSet, o *server.Options) *compatFlags {
	c := &compatFlags{}
	fs.BoolVar(&o.RedisCluster, "redis-cluster", false, "one --redis address is a Cluster's (REDIS_TYPE=CLUSTER)")
	fs.BoolVar(&o.StrictConfig, "strict-config", false, "refuse configuration envoyproxy/ratelimit reads with a silent meaning (a rate_limit without requests_per_unit, a field in a block that does not take it, a second YAML document); without it they load with a warning naming file and line")
	fs.BoolVar(&o.MergeDomains, "merge-domain-config", false, "let several files define one domain, merged (MERGE_DOMAIN_CONFIG)")
	fs.BoolVar(&o.Compat.StopIncrementWhenOverLimit, "stop-cache-key-increment-when-overlimit", false, "count none of a request's hits when one of its descriptors is over the limit (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)")
	fs.BoolVar(&o.Compat.QuotaMode, "quota-mode", false, "every descriptor in quota mode: OVER_LIMIT only when all are over (QUOTA_MODE)")
	fs.BoolVar(&o.Compat.ResponseDynamicMetadata, "response-dynamic-metadata", false, "return the domain, descriptors and metadata of passed descriptors as dynamic metadata (RESPONSE_DYNAMIC_METADATA)")
	fs.StringVar(&o.Compat.HeaderLimit, "limit-limit-header", "RateLimit-Limit", "name of the limit header of --response-headers (LIMIT_LIMIT_HEADER)")
	fs.StringVar(&o.Compat.HeaderRemaining, "limit-remaining-header", "RateLimit-Remaining", "name of the remaining header (LIMIT_REMAINING_HEADER)")
	fs.StringVar(&o.Compat.HeaderReset, "limit-reset-header", "RateLimit-Reset", "name of the reset header (LIMIT_RESET_HEADER)")
	fs.StringVar(&c.keyLayout, "key-layout", "ratelimitd", "Redis keys of exact fixed-window rules: ratelimitd, or envoy (envoyproxy/ratelimit's keys and counting, to share counts with it during a migration)")
	fs.StringVar(&o.Compat.CacheKeyPrefix, "cache-key-prefix", "", "prefix of the keys of --key-layout envoy (CACHE_KEY_PREFIX)")
	fs.Int64Var(&o.Compat.ExpirationJitterMaxSeconds, "expiration-jitter-max-seconds", 300, "at most that many seconds added to the expiry of the keys of --key-layout envoy (EXPIRATION_JITTER_MAX_SECONDS)")

	fs.BoolVar(&o.TLS.Redis, "redis-tls", false, "connect to Redis over TLS (REDIS_TLS)")
	fs.StringVar(&o.TLS.RedisCA, "redis-tls-cacert", "", "PEM `file` of the CA of the Redis servers' certificates (REDIS_TLS_CACERT)")
	fs.StringVar(&o.TLS.RedisCert, "redis-tls-client-cert", "", "PEM `file` of a client certificate for Redis (REDIS_TLS_CLIENT_CERT)")
	fs.StringVar(&o.TLS.RedisKey, "redis-tls-client-key", "", "PEM `file` of its key (REDIS_TLS_CLIENT_KEY)")
	fs.BoolVar(&o.TLS.RedisSkipHostnameVerification, "redis-tls-skip-hostname-verification", false, "check the Redis certificates' chain, not their names (REDIS_TLS_SKIP_HOSTNAME_VERIFICATION)")
	fs.BoolVar(&o.TLS.GRPC, "grpc-server-use-tls", false, "serve gRPC over TLS (GRPC_SERVER_USE_TLS); the certificate is reloaded when its files change")
	fs.StringVar(&o.TLS.GRPCCert, "grpc-server-tls-cert", "", "PEM `file` of the gRPC server's certificate chain (GRPC_SERVER_TLS_CERT)")
	fs.StringVar(&o.TLS.GRPCKey, "grpc-server-tls-key", "", "PEM `file` of its key (GRPC_SERVER_TLS_KEY)")
	fs.StringVar(&o.TLS.GRPCClientCA, "grpc-client-tls-cacert", "", "PEM `file` of the CA clients' certificates must be signed by: mTLS (GRPC_CLIENT_TLS_CACERT)")
	fs.StringVar(&o.TLS.GRPCClientSAN, "grpc-client-tls-san", "", "name the client certificates must be valid for (GRPC_CLIENT_TLS_SAN)")

	fs.StringVar(&c.configType, "config-type", "FILE", "where the configuration comes from: FILE (--config) or GRPC_XDS_SOTW (an xDS management server) (CONFIG_TYPE)")
	fs.StringVar(&o.XDS.Server, "config-grpc-xds-server-url", "localhost:18000", "address of the xDS management server (CONFIG_GRPC_XDS_SERVER_URL)")
	fs.StringVar(&o.XDS.NodeID, "config-grpc-xds-node-id", "default", "xDS node id the server keeps snapshots under (CONFIG_GRPC_XDS_NODE_ID)")
	fs.StringVar(&o.XDS.NodeMetadata, "config-grpc-xds-node-metadata", "", "xDS node metadata, key=value or key:value, comma-separated (CONFIG_GRPC_XDS_NODE_METADATA)")
	fs.DurationVar(&o.XDS.RetryInterval, "config-grpc-xds-server-connect-retry-interval", 0, "wait between xDS connection attempts (0: 3s) (CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL)")
	fs.BoolVar(&o.XDS.TLS, "config-grpc-xds-server-use-tls", false, "connect to the xDS server over TLS (CONFIG_GRPC_XDS_SERVER_USE_TLS)")
	fs.StringVar(&o.XDS.TLSCA, "config-grpc-xds-server-tls-cacert", "", "PEM `file` of the xDS server's CA (CONFIG_GRPC_XDS_SERVER_TLS_CACERT)")
	fs.StringVar(&o.XDS.TLSCert, "config-grpc-xds-client-tls-cert", "", "PEM `file` of a client certificate for the xDS server (CONFIG_GRPC_XDS_CLIENT_TLS_CERT)")
	fs.StringVar(&o.XDS.TLSKey, "config-grpc-xds-client-tls-key", "", "PEM `file` of its key (CONFIG_GRPC_XDS_CLIENT_TLS_KEY)")
	fs.BoolVar(&o.XDS.ForceStart, "force-start-without-initial-config", false, "with xDS, serve before the first configuration arrives (unknown domains answer OK) (FORCE_START_WITHOUT_INITIAL_CONFIG)")
	return c
}

// finish checks and applies what the flags of the peer's settings say.
// --key-layout envoy makes exact the mode of rules that name none, unless
// --mode (or RATELIMITD_MODE) says otherwise: the peer's files name no
// mode, and only exact rules share the peer's counts.
func (c *compatFlags) finish(fs *flag.FlagSet, o *server.Options) error {
	switch c.keyLayout {
	case "ratelimitd":
	case "envoy":
		o.Compat.EnvoyKeys = true
		modeSet := false
		fs.Visit(func(f *flag.Flag) { modeSet = modeSet || f.Name == "mode" })
		if !modeSet {
			o.Defaults.Mode = config.Exact
			o.Logger.Info("--key-layout envoy: rules that name no mode are exact, counted in envoyproxy/ratelimit's keys")
		}
	default:
		return fmt.Errorf("--key-layout %q: want ratelimitd or envoy", c.keyLayout)
	}
	switch strings.ToUpper(c.configType) {
	case "FILE":
		o.XDS.Server = ""
	case "GRPC_XDS_SOTW":
		if len(o.ConfigPaths) > 0 {
			return errors.New("--config-type GRPC_XDS_SOTW takes the configuration from xDS: give no --config")
		}
	default:
		return fmt.Errorf("--config-type %q: want FILE or GRPC_XDS_SOTW", c.configType)
	}
	if o.Compat.ExpirationJitterMaxSeconds < 0 {
		return errors.New("--expiration-jitter-max-seconds must not be negative")
	}
	return nil
}

// peerEnv maps the environment variables of envoyproxy/ratelimit that are
// not the name of a flag in capitals to a function setting flags from
// their value.
var peerEnv = map[string]func(fs *flag.FlagSet, v string) error{
	"REDIS_URL":                      redisURL,
	"REDIS_AUTH":                     redisAuth,
	"REDIS_POOL_SIZE":                setter("redis-pool-size"),
	"PORT":                           hostPort("http", "HOST"),
	"GRPC_PORT":                      hostPort("grpc", "GRPC_HOST"),
	"LIMIT_RESPONSE_HEADERS_ENABLED": setter("response-headers"),
	"SHADOW_MODE":                    setter("shadow-mode"),
	"LOG_LEVEL":                      setter("log-level"),
	"RUNTIME_ROOT":                   runtimeDir,
}

// peerUnsupported are settings of envoyproxy/ratelimit that ratelimitd does
// not have, with what to do instead.
var peerUnsupported = map[string]string{
	"BACKEND_TYPE":              "only redis is supported; memcache is not",
	"REDIS_PERSECOND":           "per-second limits need no Redis of their own here (they cost no more than others); the setting is ignored",
	"REDIS_TIMEOUT":             "ratelimitd bounds every wait on Redis by --timeout (100ms) and then applies the rule's failure mode; the setting is ignored",
	"USE_STATSD":                "metrics are Prometheus' on --http /metrics; the setting is ignored",
	"LOCAL_CACHE_SIZE_IN_BYTES": "ratelimitd decides over-limit keys in memory by itself; the setting is ignored",
}

// fromPeerEnv sets every flag not set yet (on the command line or by its
// RATELIMITD_ variable) from envoyproxy/ratelimit's variable of the same
// setting, when set. It returns what to log of it, once there is a logger.
func fromPeerEnv(fs *flag.FlagSet) (func(*slog.Logger), error) {
	var notes []func(*slog.Logger)
	report := func(log *slog.Logger) {
		for _, n := range notes {
			n(log)
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var read []string
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if _, special := peerEnv[env]; special || !peerFlag[f.Name] {
			return
		}
		if v, ok := os.LookupEnv(env); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
			read = append(read, env)
		}
	})
	if err != nil {
		return nil, err
	}
	for env, apply := range peerEnv {
		v, ok := os.LookupEnv(env)
		if !ok {
			continue
		}
		if e := apply(fs, v); e != nil {
			return nil, fmt.Errorf("%s=%q: %w", env, v, e)
		}
		read = append(read, env)
	}
	for env, why := range peerUnsupported {
		v, ok := os.LookupEnv(env)
		if !ok {
			continue
		}
		if env == "BACKEND_TYPE" && strings.EqualFold(v, "redis") {
			continue
		}
		if env == "BACKEND_TYPE" {
			return nil, fmt.Errorf("%s=%q: %s", env, v, why)
		}
		notes = append(notes, func(log *slog.Logger) {
			log.Warn("envoyproxy/ratelimit setting not used", "setting", env, "why", why)
		})
	}
	if len(read) > 0 {
		sort.Strings(read)
		notes = append(notes, func(log *slog.Logger) {
			log.Info("read envoyproxy/ratelimit settings from the environment", "settings", strings.Join(read, ","))
		})
	}
	return report, nil
}

// peerFlag names the flags whose name in capitals is envoyproxy/ratelimit's
// setting of the same meaning.
var peerFlag = map[string]bool{}

func init() {
	for _, n := range []string{"merge-domain-config", "stop-cache-key-increment-when-overlimit", "quota-mode",
		"response-dynamic-metadata", "limit-limit-header", "limit-remaining-header", "limit-reset-header",
		"cache-key-prefix", "expiration-jitter-max-seconds", "redis-tls", "redis-tls-cacert", "redis-tls-client-cert",
		"redis-tls-client-key", "redis-tls-skip-hostname-verification", "grpc-server-use-tls", "grpc-server-tls-cert",
		"grpc-server-tls-key", "grpc-client-tls-cacert", "grpc-client-tls-san", "config-type",
		"config-grpc-xds-server-url", "config-grpc-xds-node-id", "config-grpc-xds-node-metadata",
		"config-grpc-xds-server-connect-retry-interval", "config-grpc-xds-server-use-tls",
		"config-grpc-xds-server-tls-cacert", "config-grpc-xds-client-tls-cert", "config-grpc-xds-client-tls-key",
		"force-start-without-initial-config"} {
		peerFlag[n] = true
	}
}

func setter(name string) func(*flag.FlagSet, string) error {
	return func(fs *flag.FlagSet, v string) error { return setIfUnset(fs, name, v) }
}

// setIfUnset sets flag name to v unless the command line or its RATELIMITD_
// variable set it.
func setIfUnset(fs *flag.FlagSet, name, v string) error {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	if set {
		return nil
	}
	return fs.Set(name, v)
}

// hostPort sets an address flag from a port variable and its host one.
func hostPort(name, hostEnv string) func(*flag.FlagSet, string) error {
	return func(fs *flag.FlagSet, port string) error {
		return setIfUnset(fs, name, os.Getenv(hostEnv)+":"+port)
	}
}

// redisURL reads REDIS_URL with REDIS_TYPE: SINGLE (an address), CLUSTER
// (addresses, comma-separated) or SENTINEL (the master's name, then the
// Sentinels' addresses). A unix socket path is not supported.
func redisURL(fs *flag.FlagSet, v string) error {
	parts := strings.Split(v, ",")
	switch t := strings.ToUpper(os.Getenv("REDIS_TYPE")); t {
	case "", "SINGLE":
		if strings.HasPrefix(v, "/") {
			return errors.New("a unix socket is not supported: give host:port")
		}
		return setIfUnset(fs, "redis", v)
	case "CLUSTER":
		if err := setIfUnset(fs, "redis", v); err != nil {
			return err
		}
		if len(parts) == 1 {
			return setIfUnset(fs, "redis-cluster", "true")
		}
		return nil
	case "SENTINEL":
		if len(parts) < 2 {
			return errors.New("REDIS_TYPE=SENTINEL wants REDIS_URL as <master name>,<sentinel>[,<sentinel>]")
		}
		if err := setIfUnset(fs, "redis-master", parts[0]); err != nil {
			return err
		}
		return setIfUnset(fs, "redis", strings.Join(parts[1:], ","))
	default:
		return fmt.Errorf("REDIS_TYPE %q: want SINGLE, CLUSTER or SENTINEL", t)
	}
}

// redisAuth reads REDIS_AUTH: "password" or "user:password".
func redisAuth(fs *flag.FlagSet, v string) error {
	if user, pass, ok := strings.Cut(v, ":"); ok {
		if err := setIfUnset(fs, "redis-username", user); err != nil {
			return err
		}
		return setIfUnset(fs, "redis-password", pass)
	}
	return setIfUnset(fs, "redis-password", v)
}

// runtimeDir reads RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and
// RUNTIME_APPDIRECTORY (default "config") as the configuration directory.
func runtimeDir(fs *flag.FlagSet, root string) error {
	app := os.Getenv("RUNTIME_APPDIRECTORY")
	if app == "" {
		app = "config"
	}
	return setIfUnset(fs, "config", filepath.Join(root, os.Getenv("RUNTIME_SUBDIRECTORY"), app))
}
