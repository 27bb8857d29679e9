# netpol's image for people with Docker (make image builds the same thing
# without it): docker build -t netpol.local/netpol:dev .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o /out/netpol ./cmd/netpol && mkdir -p /out/tmp

FROM scratch
COPY --from=build /out/netpol /bin/netpol
COPY --from=build --chmod=1777 /out/tmp /tmp
ENTRYPOINT ["/bin/netpol"]
