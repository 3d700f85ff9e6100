-- Argo CD health of an Application (Lua 5.1), so that an app of apps waits, wave by wave, for its child
-- Applications (Argo CD assesses no Application's health by itself). Argo CD's docs give the first part; a
-- new Application reports Healthy before its first sync has applied anything, so until it is also Synced
-- it is Progressing here, or the parent would move to the next wave at once.
local hs = {}
hs.status = "Progressing"
hs.message = ""
if obj.status ~= nil and obj.status.health ~= nil then
  hs.status = obj.status.health.status
  if obj.status.health.message ~= nil then
    hs.message = obj.status.health.message
  end
  local sync = obj.status.sync
  if hs.status == "Healthy" and (sync == nil or sync.status ~= "Synced") then
    hs.status = "Progressing"
    hs.message = "Healthy, not Synced yet"
  end
end
return hs
