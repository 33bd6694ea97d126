"""The controller's HTTP routes, one ``APIRouter`` per resource: service, jobs, pools."""
