# The launcher with Envoy beside it, for the sidecar's launcher container
# (ENVOY_BINARY=/usr/local/bin/envoy). Build context: bin/ after `make build`:
#   docker build -t meshagent/launcher-envoy:dev -f deploy/kubernetes/images/launcher-envoy.Dockerfile bin
ARG ENVOY_IMAGE=envoyproxy/envoy:v1.36.2
FROM ${ENVOY_IMAGE}
COPY launcher /usr/local/bin/launcher
USER 1337:1337
ENTRYPOINT ["/usr/local/bin/launcher"]
