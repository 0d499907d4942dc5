"""DataHub's GraphQL API (`/api/graphql`), for what DataHub's Python client and CLI call: the schema (SDL, in
DataHub's names), its limits, resolvers and execution. The HTTP route is app.api.graphql."""
