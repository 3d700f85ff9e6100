-- Argo CD health of an Application (Lua 5.1), as Argo CD's docs give it: an app of apps then waits, wave by
-- wave, for its child Applications to be Healthy (Argo CD assesses no Application's health by itself).
local hs = {}
hs.status = "Progressing"
hs.message = ""
if obj.status ~= nil and obj.status.health ~= nil then
  hs.status = obj.status.health.status
  if obj.status.health.message ~= nil then
    hs.message = obj.status.health.message
  end
end
return hs
