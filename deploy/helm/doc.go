// Package helm holds no code: its test renders the Helm chart in ./sluice
// with Helm's own engine and checks every manifest against Kubernetes' types
// and against the flags the limiter and the bridge have (README.md).
//
// It is a module of its own (github.com/sluicehq/sluice/deploy/helm) so that
// Helm and the Kubernetes API types stay out of the main module's
// dependencies; `make test` runs it with `cd deploy/helm && go test ./...`.
package helm
