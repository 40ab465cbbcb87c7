module gpu-operator.local/tools/registry

go 1.26.0

require (
	github.com/google/go-containerregistry v0.22.1
	golang.org/x/crypto v0.59.0
)
