module sandgate.example.test/tour

go 1.22

require github.com/alibaba/OpenSandbox/sdks/sandbox/go v1.2.0

require golang.org/x/sync v0.7.0 // indirect
