module github.com/distkit-go/distlock

go 1.26.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/google/uuid v1.6.0
	github.com/redis/rueidis v1.0.79
	github.com/stretchr/testify v1.12.1
	github.com/yuin/gopher-lua v1.1.1
	go.uber.org/goleak v1.3.0
	golang.org/x/sys v0.47.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
