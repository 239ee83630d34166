// The @ag-ui/client of this folder (drive.mjs imports it from the folder it runs in), and
// the event schemas of its @ag-ui/core (1.0 keeps the zod schemas in a subpath).
export * from "@ag-ui/client";
export { EventSchemas } from "@ag-ui/core/schemas";
